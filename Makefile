# meshtrain: the two commands of the README, and the pieces they are made of.
#   make demo   install packages, build, run the main demo
#   make test   install packages, build, run every test
#   make post-train-demo   SFT then DPO of the demo model (after make demo's pretraining)
#   make rl-demo   SFT then GRPO on the shipped reverse task (held-out accuracy rises)
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all setup build build-demo test demo post-train-demo rl-demo labs bench check-docs clean
all: build

setup:
	./scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# What the demos run: the meshtrain binary (it builds meshtrain-tokenize, which it calls), not the tests.
build-demo: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target meshtrain

# MESHTRAIN_TEST_FULL_SUITE: the whole suite runs, so tests/check_skips.py must
# see every entry's ledger and fails on a test that ran in none.
test: build
	cd $(BUILD) && MESHTRAIN_TEST_FULL_SUITE=1 ctest --output-on-failure -j$(JOBS)

# The demo: tokenize the King James Bible, train a small GPT on 4 local ranks
# (tp=2 x dp=2, sequence parallel) with evaluation and sharded checkpoints,
# verify the checkpoint, score it on a multiple-choice task made from the
# held-out verses (which ending completes each), sample from it in one process;
# then a plan for Llama 2 70B.
demo: build-demo data/kjv/train.bin data/kjv/ending.jsonl
	rm -rf runs/kjv-tiny
	./$(BUILD)/meshtrain train configs/kjv-tiny.toml --set eval.tasks='["data/kjv/ending.jsonl"]'
	./$(BUILD)/meshtrain ckpt verify runs/kjv-tiny/ckpt
	./$(BUILD)/meshtrain eval runs/kjv-tiny/ckpt --task data/kjv/ending.jsonl
	./$(BUILD)/meshtrain plot runs/kjv-tiny/log.metrics --out runs/kjv-tiny/curves.svg --labels kjv-tiny --title "make demo"
	./$(BUILD)/meshtrain sample runs/kjv-tiny/ckpt --prompt "And God said" --tokens 48 --samples 2 --top-k 40 --top-p 0.95
	./$(BUILD)/meshtrain plan --model llama2-70b --gpus 64 --gpu h100 --seq 4096 --global-batch 64

# The post-training demo (minutes on 2 cores): from the demo's pretrained model
# (trained first when missing), SFT to quote Genesis 1-2 verse by verse, then
# DPO with LoRA against wrong verses; exact match before and after SFT, and the
# DPO reward margin and accuracy in its log. Data: scripts/kjv_post_train.py.
POST = data/kjv-post
post-train-demo: build-demo data/kjv/train.bin
	[ -f runs/kjv-tiny/ckpt/step_00000150/manifest.json ] || ./$(BUILD)/meshtrain train configs/kjv-tiny.toml
	mkdir -p $(POST)
	python3 scripts/kjv_post_train.py $(POST) 2
	./$(BUILD)/meshtrain tokenize chat --input $(POST)/chats.jsonl --tokenizer data/kjv/tokenizer.model --out $(POST)/sft --seq 128 --force
	./$(BUILD)/meshtrain tokenize prefs --input $(POST)/prefs.jsonl --tokenizer data/kjv/tokenizer.model --out $(POST)/dpo --seq 128 --force
	./$(BUILD)/meshtrain eval exact-match runs/kjv-tiny/ckpt --data $(POST)/sft/train.bin --document-mask
	rm -rf runs/kjv-sft runs/kjv-dpo
	./$(BUILD)/meshtrain train configs/kjv-sft.toml
	./$(BUILD)/meshtrain eval exact-match runs/kjv-sft/ckpt --data $(POST)/sft/train.bin --document-mask
	./$(BUILD)/meshtrain train configs/kjv-dpo.toml
	./$(BUILD)/meshtrain eval exact-match runs/kjv-dpo/ckpt --data $(POST)/sft/train.bin --document-mask

# The reinforcement-learning demo (minutes on 2 cores): the shipped reverse task
# (tokenize task: SFT data, RL prompts, held-out words in neither), a short SFT,
# held-out accuracy, GRPO (its log: reward per step, held-out accuracy every 25
# steps), held-out accuracy again. bench/rl_demo.sh tabulates and plots it.
rl-demo: build-demo
	./$(BUILD)/meshtrain tokenize task --name reverse --digits 6 --out data/reverse --seq 64 --force
	rm -rf runs/reverse-sft runs/reverse-grpo
	./$(BUILD)/meshtrain train configs/reverse-sft.toml
	./$(BUILD)/meshtrain eval task runs/reverse-sft/ckpt --data data/reverse/eval.jsonl
	./$(BUILD)/meshtrain train configs/reverse-grpo.toml
	./$(BUILD)/meshtrain eval task runs/reverse-grpo/ckpt --data data/reverse/eval.jsonl

data/kjv/train.bin: | build-demo
	mkdir -p data/kjv
	bible -f Gen1:1-Rev22:21 | sed 's/^[^ ]* //' > data/kjv/kjv.txt
	./$(BUILD)/meshtrain tokenize --input data/kjv/kjv.txt --out data/kjv --vocab-size 4096 --force

# The held-out verses (tokenize's default --val-fraction 0.005) as questions: which ending completes each.
data/kjv/ending.jsonl: data/kjv/train.bin
	./$(BUILD)/meshtrain data choices data/kjv/kjv.txt --out data/kjv/ending.jsonl --force

labs: build-demo
	for lab in 01 02 03 04 05 06; do ./$(BUILD)/meshtrain lab $$lab --nproc 4 || exit 1; done
	./$(BUILD)/meshtrain lab 07 --nproc 1

# Every page under docs/ is written whole by its script (bench/header.sh's seal).
bench: build
	./bench/demo.sh $(BUILD)
	./bench/comm.sh $(BUILD)
	./bench/comm_axes.sh $(BUILD)
	./bench/all_to_all.sh $(BUILD)
	./bench/moe.sh $(BUILD)
	./bench/symptoms.sh $(BUILD)
	./bench/tp_block.sh $(BUILD)
	./bench/train.sh $(BUILD)
	./bench/optim.sh $(BUILD)
	./bench/fused_ops.sh $(BUILD)
	./bench/loss.sh $(BUILD)
	./bench/dp.sh $(BUILD)
	./bench/zero.sh $(BUILD)
	./bench/pipeline.sh $(BUILD)
	./bench/plan.sh $(BUILD)
	./bench/data.sh $(BUILD)
	./bench/tokenize.sh $(BUILD)
	./bench/precision.sh $(BUILD)
	./bench/post_train.sh $(BUILD)
	./bench/rl.sh $(BUILD)
	./bench/rl_demo.sh $(BUILD)
	./bench/build.sh $(JOBS)

# docs/ pages unchanged since their scripts wrote them; README.md's numbers quoted from them (bench/check_docs.py).
check-docs:
	python3 bench/check_docs.py

clean:
	rm -rf $(BUILD)
