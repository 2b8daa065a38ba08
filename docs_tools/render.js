// Renders TeX with KaTeX for docs_tools/katex.py: one JSON request a line on stdin
// ({"tex": ..., "display": bool}), one JSON answer a line on stdout ({"html": ...} or {"error": ...}).
const katex = require("katex");
const readline = require("readline");

const rl = readline.createInterface({ input: process.stdin, terminal: false });
rl.on("line", (line) => {
  const { tex, display } = JSON.parse(line);
  let answer;
  try {
    // strict "error": a construct KaTeX only tolerates fails the build, as a warning would.
    answer = { html: katex.renderToString(tex, { displayMode: display, throwOnError: true, strict: "error" }) };
  } catch (e) {
    answer = { error: String(e.message || e) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
});
