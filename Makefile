# ImageNet training with fast data loading. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JPEGCROP := decode/jpeg/_jpegcrop.so
DEMO ?= demo
IMAGENET ?=
OUT ?=
FORMAT ?= lmdb
# convert-imagenet: MAX_SIDE=512 QUALITY=90 stores images at most 512 px on the longer side
MAX_SIDE ?=
QUALITY ?=
# REENCODE_ALL=1 re-encodes every image at QUALITY, as FFCV's writer does (lossy; docs/raw-share.md)
REENCODE_ALL ?=
CAP_FLAGS = $(if $(MAX_SIDE), --max-side $(MAX_SIDE))$(if $(QUALITY), --quality $(QUALITY))$(if $(REENCODE_ALL), --reencode-all)
# convert-imagenet: RAW_BUDGET=1.5x (or 200G) stores the images that save the most decode time per
# extra byte as raw pixels, the store at most 1.5x the JPEG-only one (docs/raw-share.md)
RAW_BUDGET ?=
RAW_FLAGS = $(if $(RAW_BUDGET), --raw-budget $(RAW_BUDGET))
JOBS ?= 8
CONFIG ?= configs/resnet18.yaml
DATA ?=
ARGS ?=
OUTPUT ?= runs
TB_HOST ?= localhost
TB_PORT ?= 6006
IMAGE ?= imagenet-fast
NGC_TAG ?=
CMD ?=
# docker-run: -it only from a terminal; the command is CMD, else `python3 main.py ARGS`, else the
# image's default (python3 main.py --help)
DOCKER_TTY := $(shell [ -t 0 ] && echo -it)
DOCKER_CMD = $(if $(CMD),$(CMD),$(if $(ARGS),python3 main.py $(ARGS)))

.DEFAULT_GOAL := help
.PHONY: help install demo test test-heavy test-durations test-slurm bench bench-ffcv \
  convert-imagenet train tensorboard docker-build docker-run test-docker clean gpu-bundle gpu-check \
  gpu-dry-run

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

install: $(STAMP) $(JPEGCROP) ## create .venv with torch, torchvision, TorchCodec, nvImageCodec, lmdb, ... and Pillow-SIMD (falls back to Pillow); build decode/jpeg/_jpegcrop.so

$(STAMP): requirements.txt docker/install-pillow-simd.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# DALI's CUDA 12 and CUDA 13 wheels write the same nvidia/dali folder: where an older
	@# requirements.txt left the CUDA 12 one, remove both so the CUDA 13 one installs whole.
	! $(PY) -m pip show -q nvidia-dali-cuda120 2>/dev/null \
	  || $(PY) -m pip uninstall -y -q nvidia-dali-cuda120 nvidia-dali-cuda130
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	sh docker/install-pillow-simd.sh $(PY)
	$(PY) -c "from decode import image_library; print('image library:', image_library())"
	touch $(STAMP)

# Our crop + scale decoder (docs/ffcv-and-decode.md). Without a C compiler or libjpeg-dev it is
# not built and the loaders say so at start-up (nvImageCodec windows, PIL draft scaling).
$(JPEGCROP): decode/jpeg/_jpegcrop.c
	$(CC) -O2 -shared -fPIC -Wall -Wextra -Werror -o $@ $< -ljpeg \
	  || echo "$@ not built (needs a C compiler and libjpeg-dev): crop windows through nvImageCodec, scaled ones through PIL"

demo: install ## generate a small dataset, convert it to LMDB, train ResNet-18 on CPU, show top-1 rising
	rm -rf $(DEMO)
	$(PY) -m tools.datagen $(DEMO)/jpeg --classes 10 --train-per-class 40 --val-per-class 10
	$(PY) folder2lmdb.py --dataset $(DEMO)/jpeg/train -o $(DEMO)/lmdb/train
	$(PY) folder2lmdb.py --dataset $(DEMO)/jpeg/val -o $(DEMO)/lmdb/val
	$(PY) main.py -c configs/smoke.yaml --lmdb $(DEMO)/lmdb --output-dir $(DEMO)/output
	$(PY) -c "import json; r = [json.loads(l) for l in open('$(DEMO)/output/metrics.jsonl')]; \
	print('val top-1 by epoch:', ' -> '.join(f\"{x['val_acc1']:.0f}%\" for x in r)); \
	assert r[-1]['val_acc1'] > r[0]['val_acc1'], 'validation accuracy did not rise'"

# make test's pytest-xdist processes (2: both cores of a 2-core machine, measured in
# docs/architecture.md's "Where the suite's time goes"; 0: all tests in one process).
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test: install ## run the test suite (generated data; also the real sample in ../shared/data/imagenet-sample where present; not the SLURM or heavy tests)
	$(PY) -m pytest -q -rs $(XDIST)

test-heavy: install ## the opt-in full-size and long tests (DALI's 476 MB wheel from parts, the GPU check's dry runs), which CI also runs
	$(PY) -m pytest -q -rs -m heavy

test-durations: install ## make test's suite in one process with its 40 slowest tests (pytest --durations)
	$(PY) -m pytest -q -rs --durations=40 --durations-min=1

# The SLURM tests start their own munged, slurmctld and slurmd on free ports of 127.0.0.1 with a
# generated slurm.conf (tests/helpers/slurm_cluster.py); they need only the programs, from Debian.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
SLURM_COMMANDS := munged slurmctld slurmd srun sbatch scontrol scancel squeue sinfo

test-slurm: install ## srun/sbatch/requeue tests against a real SLURM on 127.0.0.1 (installs Debian's packages as root)
	@missing=$$(for c in $(SLURM_COMMANDS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$c >/dev/null || echo $$c; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make test-slurm: $$(echo $$missing) not installed; as root on Debian/Ubuntu: apt-get install $(SLURM_PACKAGES)"; exit 1; fi; \
	  echo "make test-slurm: installing $(SLURM_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null; \
	fi
	$(PY) -m pytest -q -rs -m slurm tests/engine/test_slurm.py tests/formats/test_shards_slurm.py

# Benchmarks time DATA= (an ImageNet-layout folder); without it, 400 generated ImageNet-sized JPEGs.
BENCH_DATA = $(or $(DATA),bench-data)
BENCH_NOTE = $(if $(DATA),,@echo "$@: no DATA=: timing generated ImageNet-sized JPEGs in bench-data/ (DATA=/path/to/imagenet for real ones)")
bench-data/train:
	$(PY) -m tools.datagen bench-data --classes 100 --train-per-class 4 --val-per-class 1 \
	  --min-size 300 --max-size 500 > /dev/null

bench: install $(if $(DATA),,bench-data/train) ## loader images/s side by side (stock, decode-only, ours): DATA=/path/to/imagenet (default: generated JPEGs)
	$(BENCH_NOTE)
	$(PY) -m benchmarks.loading.throughput --data $(BENCH_DATA) --out bench-output

# FFCV 1.0.2 lives in its own environment (.ffcv/, git-ignored), never in .venv: Debian's
# libturbojpeg0-dev, libopencv-dev and pkg-config (installed where missing, as root), then
# pinned numpy/numba/OpenCV and ffcv==1.0.2 (benchmarks/ffcv/setup.sh says why each).
FFCV_VENV ?= .ffcv
bench-ffcv: install $(if $(DATA),,bench-data/train) ## FFCV 1.0.2 (in .ffcv/) beside main.py --benchmark-data on the same bytes, 160/192/224 px: DATA=/path/to/imagenet (default: generated JPEGs)
	$(BENCH_NOTE)
	sh benchmarks/ffcv/setup.sh $(FFCV_VENV) $(PY)
	$(PY) -m benchmarks.ffcv --data $(BENCH_DATA) \
	  --ffcv-python $(FFCV_VENV)/bin/python --out bench-output/ffcv

# FORMAT=lmdb runs folder2lmdb.py, FORMAT=shards folder2shards.py (WebDataset tar shards); both
# take the same arguments here, and both write the training records in a seeded global shuffle.
# IMAGENET is the folder ImageNet was downloaded into, as downloaded: the official tars + devkit,
# Kaggle's ILSVRC tree, Hugging Face's repository folder, or train/ and val/ class folders
# (formats/sources detects which; ALLOW_PARTIAL=1 converts an incomplete one).
ALLOW_PARTIAL ?=
# convert-imagenet: ARRAY=N submits a SLURM job array of N tasks (slurm/convert.sbatch; shards of
# MAX_PER_SHARD records, the same files for any N; docs/slurm.md#converting-on-the-cluster)
ARRAY ?=
MAX_PER_SHARD ?= 1000
CONVERT_FLAGS = -j $(JOBS)$(if $(ALLOW_PARTIAL), --allow-partial)$(CAP_FLAGS)$(RAW_FLAGS)
convert-imagenet: install ## IMAGENET=/path/to/download OUT=/path/to/out [FORMAT=shards [ARRAY=N]] [MAX_SIDE=512 QUALITY=90] [REENCODE_ALL=1] [RAW_BUDGET=1.5x]: train and val to LMDB (default) or shards (ARRAY: by a SLURM job array)
	@test -n "$(IMAGENET)" -a -n "$(OUT)" -a '(' "$(FORMAT)" = lmdb -o "$(FORMAT)" = shards ')' \
	  || { echo "usage: make convert-imagenet IMAGENET=/path/to/download OUT=/path/to/out [FORMAT=lmdb|shards [ARRAY=N]] [ALLOW_PARTIAL=1] [MAX_SIDE=N QUALITY=Q] [REENCODE_ALL=1] [RAW_BUDGET=1.5x]"; exit 2; }
ifeq ($(ARRAY),)
	$(PY) folder2$(FORMAT).py --dataset $(IMAGENET) --split train -o $(OUT)/train $(CONVERT_FLAGS) --shuffle-seed 0
	$(PY) folder2$(FORMAT).py --dataset $(IMAGENET) --split val -o $(OUT)/val $(CONVERT_FLAGS)
else
	@test "$(FORMAT)" = shards || { echo "make convert-imagenet: ARRAY=N converts to shards: add FORMAT=shards"; exit 2; }
	@mkdir -p logs; for split in train val; do \
	  args="--dataset $(IMAGENET) --split $$split -o $(OUT)/$$split --max-per-shard $(MAX_PER_SHARD)$(if $(ALLOW_PARTIAL), --allow-partial)$(CAP_FLAGS)$(RAW_FLAGS)"; \
	  job=$$(sbatch --parsable --array=0-$$(($(ARRAY) - 1)) slurm/convert.sbatch $$args) || exit 1; \
	  fin=$$(sbatch --parsable --dependency=afterok:$$job --cpus-per-task=2 slurm/convert.sbatch $$args --finish) || exit 1; \
	  echo "$$split: array job $$job ($(ARRAY) tasks), index step $$fin; logs in logs/"; done
endif

train: install ## CONFIG=configs/resnet50.yaml DATA=/path/to/lmdb ARGS='--lmdb ...': train with a preset
	@test -n "$(DATA)" || { echo "usage: make train CONFIG=configs/resnet18.yaml DATA=/path/to/data [ARGS='--lmdb']"; exit 2; }
	$(PY) main.py -c $(CONFIG) $(DATA) $(ARGS)

tensorboard: install ## OUTPUT=runs: serve TensorBoard for every run under OUTPUT (TB_HOST=0.0.0.0 to share)
	$(PY) -m tensorboard.main --logdir $(OUTPUT) --host $(TB_HOST) --port $(TB_PORT)

docker-build: ## IMAGE=imagenet-fast [NGC_TAG=26.06-py3]: build docker/Dockerfile on NGC PyTorch
	docker build -f docker/Dockerfile -t $(IMAGE) $(if $(NGC_TAG),--build-arg NGC_TAG=$(NGC_TAG)) .

docker-run: ## DATA=/imagenet [ARGS='...' or CMD='...']: run IMAGE on all GPUs, /data read-only, OUTPUT at /output
	@test -n "$(DATA)" || { echo "usage: make docker-run DATA=/path/to/imagenet [OUTPUT=runs] [ARGS='-c configs/resnet50.yaml /data --output-dir /output/r50' | CMD='bash']"; exit 2; }
	mkdir -p $(OUTPUT)
	docker run --rm $(DOCKER_TTY) --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
	  -v $(abspath $(DATA)):/data:ro -v $(abspath $(OUTPUT)):/output $(IMAGE) $(DOCKER_CMD)

# test-docker needs no registry, Docker engine or GPU: docker/test-image.sh builds a stand-in for
# the NGC base from Debian's packages and PyPI (installing buildah and debootstrap from Debian
# where missing, as root), builds docker/Dockerfile unmodified on it, runs the project in the
# image and removes its storage. Not part of make test; .ci/run runs it (docs/docker.md).
test-docker: ## build docker/Dockerfile on a stand-in NGC base (no registry, no GPU; as root: installs buildah, debootstrap) and run the project in it
	bash docker/test-image.sh

# gpu-check runs on a GPU host with its own Python (torch, torchvision; no venv, no internet
# needed) and what gpu-bundle packs; the report and the state between steps go to GPU_OUT.
GPU_PYTHON ?= python3
GPU_OUT ?= gpu-check-output
CUDA ?=
DALI ?= 1
BUDGET ?=
STEP ?=
STEP_SIZE ?=
HOST_PYTHON ?= 3.12
BUNDLE_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))

gpu-bundle: ## offline bundle .gpu-bundle/ for a GPU host: wheels (lmdb, pytest, nvImageCodec, nvJPEG, DALI for CUDA=13) for its CPython HOST_PYTHON=3.12 + 100 images of DATA= (else generated); STEP_SIZE=64M: also in steps that each fit a transfer of 64 MiB; DALI=0: ~40 MiB
	$(BUNDLE_PY) -m tools.gpu_check.bundle.build --out .gpu-bundle --python-version $(HOST_PYTHON) $(if $(DATA),--data $(DATA)) \
	  $(if $(CUDA),--cuda $(CUDA)) $(if $(filter 0,$(DALI)),--no-dali) $(if $(STEP_SIZE),--step-size $(STEP_SIZE))

gpu-check: ## on a GPU host: every row, most important first (35-40 min on an H100); BUDGET=15m: what fits; STEP=N: step N of the bundle -> GPU_OUT (gpu-check-output): report.md, report.json, an archive; exit 3: not proven
	$(GPU_PYTHON) -m tools.gpu_check --out $(GPU_OUT)$(if $(BUDGET), --budget $(BUDGET))$(if $(STEP), --step $(STEP)) $(ARGS)

gpu-dry-run: install ## the bundle's steps (or the whole bundle) run here on CPU backends as on a GPU host: bytes and seconds per step, the install, one archive per step
	$(PY) -m tools.gpu_check.bundle.dry_run $(ARGS)

clean: ## remove demo data, caches and test leftovers (keeps .venv)
	rm -rf $(DEMO) .pytest_cache gpu-check-output bench-data
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
