#!/usr/bin/env python3
"""The README's dependency list is scripts/deps.sh's list: every Debian package
deps.sh installs is named in the README's **Dependencies** paragraph, and every
package that paragraph names is one deps.sh installs. Usage: check_deps.py ROOT"""
import re
import sys

root = sys.argv[1]
deps = open(f"{root}/scripts/deps.sh").read()
block = re.search(r"^packages=\((.*?)^\)", deps, re.S | re.M).group(1)
script = set()
for line in block.splitlines():
    script.update(line.split("#", 1)[0].split())
# the validator deps.sh installs only when python3 cannot import one already
script.update(re.findall(r"missing\+=\(([a-z0-9.+-]+)\)", deps))

readme = open(f"{root}/README.md").read()
para = re.search(r"^\*\*Dependencies\*\*.*?(?=^\s*$)", readme, re.S | re.M)
if para is None:
    sys.exit("README.md: no **Dependencies** paragraph")
# backticked words shaped like Debian package names; paths and commands are not
named = {w for w in re.findall(r"`([^`]+)`", para.group(0))
         if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", w)}

missing, extra = sorted(script - named), sorted(named - script)
if missing:
    print("README.md's dependencies omit what scripts/deps.sh installs:", " ".join(missing))
if extra:
    print("README.md's dependencies name what scripts/deps.sh does not install:", " ".join(extra))
if missing or extra:
    sys.exit(1)
print(f"README.md and scripts/deps.sh name the same {len(script)} packages")
