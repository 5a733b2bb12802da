"""EleutherAI's lm-evaluation-harness as a peer of `meshtrain eval --task` (issue 42).

  lmeval_peer.py HF_DIR TASK PREFIX OUT
      Scores meshtrain's multiple-choice TASK (JSON lines {"context", "choices", "answer"},
      data/choice_task.h) with lm-eval on HF_DIR (`meshtrain ckpt export --format hf --tokenizer`),
      as a user registers a local task: a YAML file (dataset_path json, output_type
      multiple_choice, doc_to_text the context, doc_to_choice the choices, doc_to_target the
      answer, target_delimiter "" since the choices carry their leading space), the "hf" model
      (fp32, CPU, batch 1), log_samples. PREFIX is put before every context in doc_to_text ("" for
      none; meshtrain puts the end-of-sequence token there, as before every document it trained
      on). OUT: JSON {"acc", "acc_norm", "ll": [per question, per choice], "lm_eval": version}.
"""
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

TASK = "meshtrain_choices"


def main(hf_dir, task, prefix, out):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, TASK + ".yaml"), "w") as f:
            json.dump({"task": TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": task}},
                       "test_split": "test", "output_type": "multiple_choice",
                       "doc_to_text": prefix + "{{context}}", "doc_to_choice": "{{choices}}",
                       "doc_to_target": "{{answer}}", "target_delimiter": "",
                       "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}, f)  # JSON is YAML
        results = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": hf_dir, "dtype": "float32"},
                                          tasks=[TASK], task_manager=TaskManager(include_path=d), device="cpu",
                                          batch_size=1, log_samples=True)
    metrics = results["results"][TASK]
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    ll = [[float(r[0][0]) for r in s["resps"]] for s in samples]
    with open(out, "w") as f:
        json.dump({"acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"], "ll": ll,
                   "lm_eval": lm_eval.__version__}, f)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
