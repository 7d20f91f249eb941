"""One audit's intake on the device, its summary and evidence: exits 1 where it does not pass."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.catalogue import load_catalogue
from worker.engine import run_audit

problem = load_catalogue().get("softmax").as_uncurated()
report = run_audit(problem, problem.example_solution("pytorch_fp32"), device="cuda", stages=("intake",), seed=1)
stage = report.stages[0]
print("intake", stage.status.value, stage.summary)
print(json.dumps(stage.evidence, default=str)[:3000])
sys.exit(0 if stage.status.value == "passed" else 1)
