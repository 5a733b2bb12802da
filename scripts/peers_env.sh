#!/usr/bin/env bash
# The frameworks meshtrain is checked against (issue 42), pinned, installed into the torch
# environment (scripts/torch_env.sh) so that both sides run the same torch 2.11:
#   transformers  loads meshtrain's Hugging Face export and writes what `ckpt import` reads;
#   sentencepiece, protobuf  what transformers needs to read the export's tokenizer.model;
#   peft (with accelerate)    loads `ckpt export --format peft`'s adapters on the base's export;
#   trl (with datasets)       trains DPO on meshtrain's pairs beside meshtrain's DPO;
#   lm-eval                   scores meshtrain's multiple-choice task on the export;
#   deepspeed                 trains ZeRO-1/2/3 on CPU (DS_ACCELERATOR=cpu, Gloo) beside meshtrain's.
#
#   scripts/peers_env.sh          install when needed; print the environment's python
#   scripts/peers_env.sh --check  print it when the peers are installed, else exit 1
#
# Invariant: the peers are used only when the .peers-complete marker holds the pinned versions
# and was written after each imported; torch and numpy are held at torch_env.sh's pins (a
# constraint), never moved by a peer's requirements.
set -euo pipefail

TRANSFORMERS_VERSION=5.25.0
SENTENCEPIECE_VERSION=0.2.3
PROTOBUF_VERSION=7.36.2
PEFT_VERSION=0.21.2
ACCELERATE_VERSION=1.16.0
TRL_VERSION=1.16.0
DATASETS_VERSION=5.2.0
LM_EVAL_VERSION=0.4.13
DEEPSPEED_VERSION=0.19.8
WANT="transformers $TRANSFORMERS_VERSION sentencepiece $SENTENCEPIECE_VERSION protobuf $PROTOBUF_VERSION"
WANT="$WANT peft $PEFT_VERSION accelerate $ACCELERATE_VERSION trl $TRL_VERSION datasets $DATASETS_VERSION"
WANT="$WANT lm_eval $LM_EVAL_VERSION deepspeed $DEEPSPEED_VERSION"
here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--check" ]; then
  ENV_DIR=$("$here/torch_env.sh" --check) || exit 1
  [ -f "$ENV_DIR/.peers-complete" ] && [ "$(cat "$ENV_DIR/.peers-complete")" = "$WANT" ] || exit 1
  echo "$ENV_DIR/bin/python"
  exit 0
fi

ENV_DIR=$("$here/torch_env.sh")
MARKER="$ENV_DIR/.peers-complete"
exec 9>"$ENV_DIR/.peers.lock"
flock 9
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ]; then
  echo "$ENV_DIR/bin/python"
  exit 0
fi
rm -f "$MARKER"
echo "peers_env: installing $WANT into $ENV_DIR" >&2
# The installed distributions' versions (torch's metadata says 2.11.0 where torch.__version__ adds +cu130).
pins=$("$ENV_DIR/bin/python" -c 'from importlib.metadata import version as v; print("torch==" + v("torch")); print("numpy==" + v("numpy"))')
printf '%s\n' "$pins" > "$ENV_DIR/.peers-constraints.txt"
"$ENV_DIR/bin/pip" install --no-input --quiet --disable-pip-version-check -c "$ENV_DIR/.peers-constraints.txt" \
  "transformers==$TRANSFORMERS_VERSION" "sentencepiece==$SENTENCEPIECE_VERSION" "protobuf==$PROTOBUF_VERSION" \
  "peft==$PEFT_VERSION" "accelerate==$ACCELERATE_VERSION" "trl==$TRL_VERSION" "datasets==$DATASETS_VERSION" \
  "lm-eval==$LM_EVAL_VERSION" >&2
# DeepSpeed ships a source archive whose setup.py imports torch: built against the environment's
# torch (no isolated build, which would fetch another), with none of its C++ ops compiled (the
# peer uses torch's AdamW; DeepSpeed would compile an op it needs at first use).
DS_BUILD_OPS=0 "$ENV_DIR/bin/pip" install --no-input --quiet --disable-pip-version-check --no-build-isolation \
  -c "$ENV_DIR/.peers-constraints.txt" "deepspeed==$DEEPSPEED_VERSION" >&2
"$ENV_DIR/bin/python" - <<PY >&2
import transformers
assert transformers.__version__ == "$TRANSFORMERS_VERSION", transformers.__version__
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: F401
import sentencepiece, google.protobuf
assert sentencepiece.__version__ == "$SENTENCEPIECE_VERSION", sentencepiece.__version__
assert google.protobuf.__version__ == "$PROTOBUF_VERSION", google.protobuf.__version__
import peft, accelerate, torch
assert peft.__version__ == "$PEFT_VERSION", peft.__version__
assert accelerate.__version__ == "$ACCELERATE_VERSION", accelerate.__version__
import trl, datasets
assert trl.__version__ == "$TRL_VERSION", trl.__version__
assert datasets.__version__ == "$DATASETS_VERSION", datasets.__version__
import lm_eval
assert lm_eval.__version__ == "$LM_EVAL_VERSION", lm_eval.__version__
import os
os.environ["DS_ACCELERATOR"] = "cpu"
import deepspeed
assert deepspeed.__version__ == "$DEEPSPEED_VERSION", deepspeed.__version__
assert torch.__version__.split("+")[0] == "$(echo "$pins" | sed -n 's/^torch==//p')", torch.__version__  # not moved
print("peers_env: transformers", transformers.__version__, "ready")
PY
echo "$WANT" > "$MARKER.tmp" && mv "$MARKER.tmp" "$MARKER"
echo "$ENV_DIR/bin/python"
