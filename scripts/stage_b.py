"""Print, per arm of a stage-A sweep, the overrides of its best learning rate (the report's own choice on validation)."""
import json, sys, subprocess, tempfile
out = tempfile.mkdtemp()
subprocess.run(["/work/main/.venv/bin/mhalab", "report", *sys.argv[1:], "--out", out, "--no-plots"], check=True,
               stdout=subprocess.DEVNULL)
for a in json.load(open(f"{out}/report.json"))["arms"]:
    print(a["label"].replace(", ", " "), a["chosen"].replace(", ", " "))
