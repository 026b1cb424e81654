// Validates MCP tools' input schemas with ajv, as MCP clients do before
// they call a tool. Reads {"tools": [{name, inputSchema}], "cases": {tool:
// {valid: [...], invalid: [...]}}} from the file named by its argument; every schema must compile in
// ajv's strict mode without a warning, under draft-07 (Ajv) and 2020-12
// (Ajv2020), accept each valid argument object and refuse each invalid one.
// Prints one line per failure, then "N passed, N failed"; exits 1 on any
// failure.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import Ajv2020 from "ajv/dist/2020.js";

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));

let passed = 0;
let failed = 0;
const fail = (msg) => { failed++; console.log("FAIL " + msg); };

for (const [draft, Validator] of [["draft-07", Ajv], ["2020-12", Ajv2020]]) {
  for (const tool of input.tools) {
    const where = `${tool.name} (${draft})`;
    const cases = input.cases[tool.name];
    if (!cases) {
      fail(`${where}: no cases`);
      continue;
    }
    // strict: true makes ajv's strict-mode warnings errors; the logger
    // catches what it would still only log.
    const warnings = [];
    const logger = { log() {}, warn: (...a) => warnings.push(a.join(" ")), error: (...a) => warnings.push(a.join(" ")) };
    let validate;
    try {
      validate = new Validator({ strict: true, allErrors: true, logger }).compile(tool.inputSchema);
    } catch (err) {
      fail(`${where}: schema does not compile: ${err.message}: ${JSON.stringify(tool.inputSchema)}`);
      continue;
    }
    if (warnings.length > 0) {
      fail(`${where}: ajv warns: ${warnings.join("; ")}`);
      continue;
    }
    for (const args of cases.valid) {
      if (validate(args)) {
        passed++;
      } else {
        fail(`${where} refuses ${JSON.stringify(args)}: ${ajvErrors(validate)}`);
      }
    }
    for (const args of cases.invalid) {
      if (validate(args)) {
        fail(`${where} accepts invalid ${JSON.stringify(args)}`);
      } else {
        passed++;
      }
    }
  }
}

function ajvErrors(validate) {
  return (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message}`).join("; ");
}

console.log(`ajv: ${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
