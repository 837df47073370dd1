# tandem — one entry point for building, testing and fuzzing.
#
#   make                 build the `tandem` CLI into build/release/
#   make test            build and run the CPU unit tests (CMocka)
#   make SAN=asan test   the same under AddressSanitizer (+UBSan);  SAN=ubsan: UBSan only
#   make fuzz            build the libFuzzer targets and run each for FUZZ_SECONDS (default 60)
#   make fuzz-smoke      run each fuzz target for a few seconds (CI)
#   make gpu             build cuda/ with nvcc (when nvcc exists) into build/gpu/
#   make gpu TIMELINE=1  the same with the block's kernels stamping a timeline (build/gpu-tl/)
#   make device-bundle   build/device/: the CUDA binaries plus the libraries the GPU machine lacks
#                        (COMPACT=1: the binaries stripped and compressed, NAME.xz)
#   make gpu-test        build and run tests/gpu (they skip with a message without a GPU)
#   make install PREFIX=/usr/local
#   make clean
#
# Objects go to build/<variant>/ mirroring the source tree; header dependencies come from
# -MMD -MP; a flags file forces a rebuild when compiler flags change. Missing system
# packages are installed by scripts/install-deps.sh before the first compile.

SHELL   := /bin/bash
SAN     ?=
PREFIX  ?= /usr/local
CC      ?= cc
V       ?= 0
ifeq ($(V),1)
Q :=
else
Q := @
endif
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5

ifeq ($(SAN),)
VARIANT := release
SANFLAGS :=
else ifeq ($(SAN),asan)
VARIANT := asan
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(SAN),ubsan)
VARIANT := ubsan
SANFLAGS := -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else
$(error SAN must be empty, asan or ubsan (got '$(SAN)'))
endif

OUT := build/$(VARIANT)

# Warnings are errors. -ffp-contract=off keeps a*b+c as two roundings on every compiler, so
# numeric results do not depend on FMA contraction.
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wformat=2 -Wvla -Wpointer-arith -Wundef -Wcast-align -Wnull-dereference \
        -Wdouble-promotion -Wno-format-nonliteral
CSTD := -std=c11 -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64
OPT  ?= -O2 -g
CFLAGS_ALL := $(CSTD) $(OPT) $(WARN) -ffp-contract=off -fno-strict-aliasing $(SANFLAGS) \
              -Icore -I. -MMD -MP $(CFLAGS)
LDFLAGS_ALL := $(SANFLAGS) $(LDFLAGS)
LDLIBS_ALL := -lcjson -lsqlite3 -lm -lpthread $(LDLIBS)
TEST_LDLIBS := -lcmocka

# Version and commit are compiled into the binary (provenance).
TD_VERSION := 0.1.0
TD_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
TD_DIRTY := $(shell test -n "$$(git status --porcelain 2>/dev/null)" && echo -dirty)
VERSION_FLAGS := -DTD_VERSION='"$(TD_VERSION)"' -DTD_COMMIT='"$(TD_COMMIT)$(TD_DIRTY)"'

# ---- sources (discovered, so new modules need no Makefile edit) ----------------------------
LIB_DIRS := core ref audit quality db
LIB_SRC  := $(sort $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
CLI_SRC  := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(OUT)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(OUT)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(OUT)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(OUT)/bench/%)
LIB      := $(OUT)/libtandem.a
TANDEM   := $(OUT)/tandem

.PHONY: all test check fuzz fuzz-smoke gpu gpu-test install clean deps FORCE bench demo
.DEFAULT_GOAL := all

all: $(TANDEM)
	@echo "built $(TANDEM) ($(VARIANT))"
	@$(NVCC_NOTE)

# ---- dependency check: install missing packages once, quietly when all are present --------
deps:
	@scripts/install-deps.sh

# ---- flags files: rewritten only when the flags change -------------------------------------
# write_flags: the target gets FLAGS_TEXT (a compiler's whole command line) when it differs from
# what the file holds, and says so with FLAGS_WHAT; objects depend on the file. Target-specific
# variables, not $(call) arguments: the flags contain commas (-Xcompiler -Wall,-Wextra,...).
define write_flags
@mkdir -p $(@D)
@echo '$(FLAGS_TEXT)' > $@.new
@if ! cmp -s $@.new $@; then mv $@.new $@; \
  [ -n "$$TD_QUIET_FLAGS" ] || echo "* new $(FLAGS_WHAT)"; else rm -f $@.new; fi
endef

$(OUT)/.flags: private FLAGS_TEXT = $(CC) $(CFLAGS_ALL) $(LDFLAGS_ALL) $(LDLIBS_ALL)
$(OUT)/.flags: private FLAGS_WHAT = build flags for $(VARIANT)
$(OUT)/.flags: FORCE | deps
	$(write_flags)

$(OUT)/%.o: %.c $(OUT)/.flags
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS_ALL) -c $< -o $@

# CMocka's assert_non_null() is not marked noreturn, so gcc reports dereferences after it.
$(OUT)/tests/%.o: private CFLAGS_ALL += -Wno-null-dereference

# The version file embeds the commit; rebuild it every time so the binary never lies.
$(OUT)/core/version.o: FORCE
$(OUT)/core/version.o: private CFLAGS_ALL += $(VERSION_FLAGS)

$(LIB): $(LIB_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	@$(if $(Q),echo "  AR      $@")
	$(Q)ar rcs $@ $^

$(TANDEM): $(CLI_OBJ) $(LIB)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS_ALL)

$(OUT)/tests/%: $(OUT)/tests/%.o $(LIB)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB) $(TEST_LDLIBS) $(LDLIBS_ALL)

$(OUT)/bench/%: $(OUT)/bench/%.o $(LIB)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB) $(LDLIBS_ALL)

# ---- tests ---------------------------------------------------------------------------------
# Each test binary runs from the repository root with TD_TANDEM pointing at the CLI (for
# end-to-end tests) and TD_TEST_TMP at a scratch directory under build/.
test: $(TEST_BIN) $(TANDEM)
	@mkdir -p $(OUT)/tmp
	@TD_TANDEM=$(TANDEM) TD_TEST_TMP=$(OUT)/tmp scripts/run-tests.sh $(VARIANT) $(TEST_BIN)

check: test

bench: $(BENCH_BIN)
	@echo "built: $(BENCH_BIN)"

# ---- demo ----------------------------------------------------------------------------------
# `make demo`: install what is missing and build (through $(TANDEM)), write the synthetic
# flash-next-tiny checkpoint (NVFP4 routed experts, FP8 PLE table; deterministic for the
# seed) into build/demo/, inspect it, run the audits with results stored in build/demo/tandem.db,
# list the stored runs and check this run against the baseline 'demo' (set on first use).
DEMO_DIR  := build/demo/flash-next-tiny
DEMO_SEED := 1

DEMO_DB   := build/demo/tandem.db

demo: $(TANDEM)
	@echo "== demo 1/6: generate $(DEMO_DIR) (preset flash-next-tiny, seed $(DEMO_SEED))"
	$(TANDEM) gen --preset flash-next-tiny --out $(DEMO_DIR) --seed $(DEMO_SEED) --force
	@echo "== demo 2/6: inspect the checkpoint"
	$(TANDEM) inspect --model $(DEMO_DIR)
	@echo "== demo 3/6: E4M3 codec self-audit and raw-vs-prepared scale-storage audit"
	$(TANDEM) audit e4m3 --model $(DEMO_DIR) --tp 2 --db $(DEMO_DB)
	@echo "== demo 4/6: per-layer MoE audit (ref exact vs prepared FP16 scales; 1 vs N threads)"
	$(TANDEM) audit layer --model $(DEMO_DIR) --layers 0,7 --ranks 0,3 --tokens 1,4,16 --db $(DEMO_DB)
	@echo "== demo 5/6: runs in the results store $(DEMO_DB)"
	$(TANDEM) db runs --db $(DEMO_DB) --limit 10
	@echo "== demo 6/6: regression check of these runs against the baselines (set on first use)"
	@for k in e4m3 layer; do \
	  if ! $(TANDEM) db baseline list --db $(DEMO_DB) | grep -q "^demo-$$k "; then \
	    echo "(first run: setting baseline 'demo-$$k' to the newest audit.$$k run)"; \
	    $(TANDEM) db baseline set demo-$$k latest:audit.$$k --db $(DEMO_DB) || exit 1; fi; \
	  echo "$(TANDEM) db regress --baseline demo-$$k --run latest:audit.$$k --db $(DEMO_DB)"; \
	  $(TANDEM) db regress --baseline demo-$$k --run latest:audit.$$k --db $(DEMO_DB) || exit 1; \
	done

# ---- fuzzing (clang + libFuzzer; the library is rebuilt with clang into build/fuzz) --------
FUZZ_OUT := build/fuzz
FUZZ_CC  := clang
FUZZ_CFLAGS := $(CSTD) -O1 -g -fsanitize=fuzzer-no-link,address,undefined \
               -fno-sanitize-recover=all -Icore -I. -MMD -MP -ffp-contract=off
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_OUT)/%.o)
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(FUZZ_OUT)/%)

$(FUZZ_OUT)/%.o: %.c | deps
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $< (fuzz)")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_OUT)/fuzz_%: $(FUZZ_OUT)/fuzz/fuzz_%.o $(FUZZ_LIB_OBJ)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS_ALL)

fuzz: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); mkdir -p $(FUZZ_OUT)/corpus/$$n; \
	  echo "fuzz $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(FUZZ_OUT)/corpus/$$n fuzz/corpus/$$n || exit 1; done

fuzz-smoke: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); mkdir -p $(FUZZ_OUT)/corpus/$$n; \
	  $$f -max_total_time=$(FUZZ_SMOKE_SECONDS) -max_len=65536 $(FUZZ_OUT)/corpus/$$n fuzz/corpus/$$n \
	    > $(FUZZ_OUT)/$$n.log 2>&1 || { tail -40 $(FUZZ_OUT)/$$n.log; exit 1; }; \
	  echo "fuzz $$n: $$(grep -o 'Done [0-9]* runs' $(FUZZ_OUT)/$$n.log) in $(FUZZ_SMOKE_SECONDS)s, no crash"; done

-include $(shell find build -name '*.d' 2>/dev/null)

# ---- CUDA ----------------------------------------------------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA_SRC := $(sort $(wildcard cuda/*.cu))
ifeq ($(NVCC),)
NVCC_NOTE := echo "✗ nvcc not found: cuda/ is not built (everything else is)"
else
NVCC_NOTE := echo "✓ nvcc found ($(NVCC)): 'make gpu' builds cuda/"
endif

# `make gpu` compiles cuda/*.cu with nvcc for sm_90 into build/gpu/ and links a CUDA-enabled
# CLI (build/gpu/tandem: audit/engines.c rebuilt with -DTD_HAVE_CUDA, everything else is the
# release objects) and the GPU tests tests/gpu/*.c. The CUDA runtime is linked statically, so
# the binaries need only the driver on the GPU machine. Kernels write every floating-point
# step with explicit __fmul_rn/__fadd_rn where the order matters, so no --fmad=false is
# needed for exactness (the flag would only slow the rest). `make device-bundle` copies the
# binaries plus the shared libraries the GPU machine lacks (cJSON, CMocka, SQLite) into
# build/device/ (rpath $$ORIGIN); `make gpu-test` runs the GPU tests (there, or here where a
# GPU exists; without one they skip with a message).
# `make gpu TIMELINE=1`: a diagnostic build in build/gpu-tl/ whose block kernels stamp the global
# timer (cuda/timeline.cuh; bench/gpu/moe_decode --timeline N prints the block's timeline);
# never the default build.
ifeq ($(TIMELINE),1)
GPU_OUT   := build/gpu-tl
TL_FLAGS  := -DTD_TIMELINE
else
GPU_OUT   := build/gpu
TL_FLAGS  :=
endif
NVCC_ARCH := -gencode arch=compute_90,code=sm_90
NVCCFLAGS_ALL = -std=c++17 -O3 -g $(NVCC_ARCH) -Icore -I. -Icuda -MMD -MP $(TL_FLAGS) \
                 -Xcompiler -Wall,-Wextra,-Werror,-fno-strict-aliasing $(NVCCFLAGS)
CUDA_LIBDIR ?= $(patsubst %/bin/nvcc,%,$(NVCC))/lib64
GPU_LDLIBS := -L$(CUDA_LIBDIR) -lcudart_static -lstdc++ -ldl -lrt -lpthread
GPU_RPATH  := -Wl,-rpath,'$$ORIGIN'
CUDA_OBJ   := $(CUDA_SRC:cuda/%.cu=$(GPU_OUT)/cuda/%.o)
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(GPU_OUT)/tests/%)
GPU_BENCH_BIN := \
                 $(patsubst bench/gpu/%.cu,$(GPU_OUT)/bench/%,$(sort $(wildcard bench/gpu/*.cu)))
GPU_LIB_OBJ  := $(filter-out $(OUT)/audit/engines.o,$(LIB_OBJ)) $(GPU_OUT)/audit/engines.o
GPU_TANDEM   := $(GPU_OUT)/tandem
DEVICE_DIR   := build/device
DEVICE_LIBS  := libcjson.so.1 libcmocka.so.0 libsqlite3.so.0

.PHONY: device-bundle

ifeq ($(NVCC),)
gpu device-bundle gpu-test:
	@echo "✗ nvcc not found: cannot build cuda/ (the CPU build and 'make test' do not need it)"; exit 1
else
gpu: $(GPU_TANDEM) $(GPU_TEST_BIN) $(GPU_BENCH_BIN)
	@echo "built $(GPU_TANDEM), $(GPU_TEST_BIN) and $(GPU_BENCH_BIN) (CUDA, sm_90)"

# nvcc's flags file: objects of cuda/ and bench/gpu/ are rebuilt when NVCCFLAGS (or nvcc) change
$(GPU_OUT)/.nvflags: private FLAGS_TEXT = $(NVCC) $(NVCCFLAGS_ALL)
$(GPU_OUT)/.nvflags: private FLAGS_WHAT = nvcc flags for $(GPU_OUT)
$(GPU_OUT)/.nvflags: FORCE | deps
	$(write_flags)

$(GPU_OUT)/cuda/%.o: cuda/%.cu $(GPU_OUT)/.nvflags | deps
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS_ALL) -c $< -o $@

$(GPU_OUT)/audit/engines.o: audit/engines.c $(OUT)/.flags
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $< (TD_HAVE_CUDA)")
	$(Q)$(CC) $(CFLAGS_ALL) -DTD_HAVE_CUDA -c $< -o $@

$(GPU_OUT)/tests/%.o: tests/gpu/%.c $(OUT)/.flags
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS_ALL) -Wno-null-dereference -DTD_HAVE_CUDA -Itests -c $< -o $@

$(GPU_TANDEM): $(CLI_OBJ) $(GPU_LIB_OBJ) $(CUDA_OBJ)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) $(GPU_RPATH) -o $@ $(CLI_OBJ) $(GPU_LIB_OBJ) $(CUDA_OBJ) $(LDLIBS_ALL) $(GPU_LDLIBS)

$(GPU_OUT)/tests/%: $(GPU_OUT)/tests/%.o $(GPU_LIB_OBJ) $(CUDA_OBJ)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) $(GPU_RPATH) -o $@ $< $(GPU_LIB_OBJ) $(CUDA_OBJ) $(TEST_LDLIBS) $(LDLIBS_ALL) $(GPU_LDLIBS)

# GPU benches (bench/gpu/*.cu) call the cuda/ launchers directly; cuBLAS, their baseline, is
# opened at run time (dlopen), so the bundle stays small and the build needs no cuBLAS.
# bench/gpu/mma_probe.cu and cuda/moe_mma.cu (k_wgp) use the warpgroup MMA (wgmma), which only
# the sm_90a target has
$(GPU_OUT)/bench/mma_probe.o: NVCC_ARCH = -gencode arch=compute_90a,code=sm_90a
$(GPU_OUT)/cuda/moe_mma.o: NVCC_ARCH = -gencode arch=compute_90a,code=sm_90a
$(GPU_OUT)/bench/%.o: bench/gpu/%.cu $(GPU_OUT)/.nvflags | deps
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS_ALL) -Idb -Iaudit -c $< -o $@

$(GPU_OUT)/bench/%: $(GPU_OUT)/bench/%.o $(GPU_LIB_OBJ) $(CUDA_OBJ)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) $(GPU_RPATH) -o $@ $< $(GPU_LIB_OBJ) $(CUDA_OBJ) $(LDLIBS_ALL) $(GPU_LDLIBS) -ldl

device-bundle: gpu
	@COMPACT=$(or $(COMPACT),0) scripts/device-bundle.sh $(DEVICE_DIR) "$(DEVICE_LIBS)" $(GPU_TANDEM) $(GPU_TEST_BIN) $(GPU_BENCH_BIN)

gpu-test: gpu
	@mkdir -p $(GPU_OUT)/tmp
	@TD_TANDEM=$(GPU_TANDEM) TD_TEST_TMP=$(GPU_OUT)/tmp scripts/run-tests.sh gpu $(GPU_TEST_BIN)
endif

# ---- install -------------------------------------------------------------------------------
install: $(TANDEM)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(TANDEM) $(DESTDIR)$(PREFIX)/bin/tandem
	@echo "installed $(DESTDIR)$(PREFIX)/bin/tandem"

clean:
	rm -rf build

FORCE:

.SECONDARY:
