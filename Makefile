# Thin wrapper over CMake: the README's commands.
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?=

.PHONY: all build demo test bench test-gpu bench-gpu install clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# The main job: measure standard vs FlashAttention-1 vs FlashAttention-2 on this machine (CPU; GPU when present).
demo: build
	$(BUILD)/flashattn report --quick --out report

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
