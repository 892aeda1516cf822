# Thin wrapper over CMake: the README's commands.
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?=

.PHONY: all build demo test bench test-gpu bench-gpu bench-kvcache-gpu bench-decode-gpu bench-sinks-gpu bench-ring \
	test-cpu-device clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# The main job: measure standard vs FlashAttention-1 vs FlashAttention-2, and KV-cache decoding, on this machine
# (CPU; GPU when present).
demo: build
	$(BUILD)/flashattn report --quick --out report

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# CPU: the CPU benchmark figures in one run (scripts/bench-cpu.sh sets OPENBLAS_CORETYPE for itself only).
bench:
	scripts/bench-cpu.sh

# GPU (H200): the CUDA backend's tests against the float64 oracle + compute-sanitizer, and the benchmark
# protocol against PyTorch SDPA (they build into build-cuda unless BUILD_GPU is set).
BUILD_GPU ?= build-cuda
test-gpu:
	BUILD=$(BUILD_GPU) scripts/test-gpu.sh

bench-gpu:
	BUILD=$(BUILD_GPU) scripts/bench-gpu.sh

# KV-cache decoding on the GPU against PyTorch's SDPA (bench-decode-gpu: its former name).
bench-kvcache-gpu:
	BUILD=$(BUILD_GPU) scripts/bench-kvcache-gpu.sh

bench-decode-gpu: bench-kvcache-gpu

# Learnable sinks' cost (with / without, interleaved) and (192, 128) against (128, 128) per FLOP, in one command.
bench-sinks-gpu:
	BUILD=$(BUILD_GPU) scripts/bench-sinks-gpu.sh

# GPUs (two or more H200s of one host): ring attention over NCCL against one GPU (scripts/bench-ring.sh, docs/ring.md).
bench-ring:
	BUILD=$(BUILD_GPU) scripts/bench-ring.sh

# The device host's CPU (many cores, AMX): ctest under every FA_CPU_ISA level it has, then our CLI against PyTorch's
# CPU SDPA in one command, logs under LOG_DIR (scripts/test-cpu-device.sh; it builds into build-cpu-device).
LOG_DIR ?= cpu-device-logs
test-cpu-device:
	scripts/test-cpu-device.sh $(LOG_DIR)

clean:
	rm -rf $(BUILD)
