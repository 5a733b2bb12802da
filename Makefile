# meshtrain: the two commands of the README, and the pieces they are made of.
#   make demo   install packages, build, run the main demo
#   make test   install packages, build, run every test
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
export CCACHE_SLOPPINESS = pch_defines,time_macros,include_file_mtime,include_file_ctime

.PHONY: all setup build test demo bench clean
all: build

setup:
	./scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# Until the training engine lands, the demo is LLM Lab 01-03 on 4 local ranks.
demo: build
	./$(BUILD)/meshtrain lab 01 --nproc 4
	./$(BUILD)/meshtrain lab 02 --nproc 4
	./$(BUILD)/meshtrain lab 03 --nproc 4

bench: build
	./bench/comm.sh $(BUILD)

clean:
	rm -rf $(BUILD)
