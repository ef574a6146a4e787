#!/usr/bin/env python3
"""Check JSON lines against a docs/schemas file, and that docs/formats.md
names every field of the schema.  Usage: check_schema.py SCHEMA OUTPUT FORMATS_MD"""
import json
import sys

import jsonschema


def main():
    schema_path, output_path, formats_path = sys.argv[1:4]
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.Draft7Validator(schema)
    lines = [l for l in open(output_path, encoding="utf-8").read().splitlines() if l.strip()]
    if not lines:
        sys.exit(f"{output_path}: no output to check against {schema_path}")
    for n, line in enumerate(lines, 1):
        errors = sorted(validator.iter_errors(json.loads(line)), key=str)
        if errors:
            sys.exit(f"{output_path}:{n}: {errors[0].message}\n  line: {line}")
    doc = open(formats_path, encoding="utf-8").read()
    missing = [p for p in schema["properties"] if f"`{p}`" not in doc]
    if missing:
        sys.exit(f"{formats_path} does not document {', '.join(missing)} ({schema_path})")
    print(f"{len(lines)} line(s) of {output_path} match {schema_path}")


main()
