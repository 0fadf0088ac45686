// Over file:// the browser refuses the fetch() that Sphinx's search uses to show a
// snippet of each result page (a console error per result): list the results without
// snippets there; over http(s) they stay.
if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
}
