// The site's pages for screen readers and keyboards (checked with axe-core in tests/site):
// - the theme's search button is labelled "Search" but shows "Search Ctrl+K": its name
//   becomes what it shows (WCAG 2.5.3, label in name);
// - a table or output that scrolls sideways in its own box can be reached with the keyboard
//   (tabindex 0, WCAG 2.1.1);
// - an ipywidgets slider's handle (role="slider", drawn by the widget manager after the page
//   loads) takes its widget's label as its name (WCAG 4.1.2).
function nameSliders(root) {
  for (const handle of root.querySelectorAll('[role="slider"]:not([aria-label]):not([aria-labelledby])')) {
    const widget = handle.closest(".widget-slider, .jupyter-widgets");
    const label = widget && widget.querySelector(".widget-label");
    const text = label ? label.textContent.replace(/\s+/g, " ").trim() : "";
    handle.setAttribute("aria-label", text || "slider");
  }
}
new MutationObserver(() => nameSliders(document)).observe(document.documentElement, { childList: true, subtree: true });
document.addEventListener("DOMContentLoaded", () => {
  nameSliders(document);
  for (const button of document.querySelectorAll(".search-button__button[aria-label]")) {
    const shown = button.textContent.replace(/\s+/g, " ").trim();
    if (shown) button.setAttribute("aria-label", shown);
  }
  const boxes = document.querySelectorAll(".bd-article table, .cell_output table, .cell_output .output, .cell_input pre");
  for (const box of boxes) {
    if (box.scrollWidth > box.clientWidth + 1 && !box.hasAttribute("tabindex")) {
      box.setAttribute("tabindex", "0");
    }
  }
});
