// Validate an AsyncAPI document with the AsyncAPI project's own parser (@asyncapi/parser).
// Usage: node validate.mjs FILE. Prints the parser's diagnostics as JSON lines on stdout;
// exit 0 when it has no error (warnings and hints are printed too), 1 otherwise.
import { readFileSync } from "node:fs";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";

const file = process.argv[2];
const parser = new Parser();
const { document, diagnostics } = await parser.parse(readFileSync(file, "utf8"));
for (const d of diagnostics) {
  console.log(JSON.stringify({ severity: d.severity, code: d.code, path: d.path.join("/"),
                               message: d.message }));
}
const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
process.exit(document !== undefined && errors.length === 0 ? 0 : 1);
