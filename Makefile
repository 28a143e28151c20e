# ImageNet training with fast data loading. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO ?= demo
IMAGENET ?=
OUT ?=
JOBS ?= 8
CONFIG ?= configs/resnet18.yaml
DATA ?=
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install demo test convert-imagenet train clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv with torch, torchvision, lmdb, ... and Pillow-SIMD (falls back to Pillow)

$(STAMP): requirements.txt docker/install-pillow-simd.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	sh docker/install-pillow-simd.sh $(PY)
	$(PY) -c "from loaders._transforms import image_library; print('image library:', image_library())"
	touch $(STAMP)

demo: install ## generate a small dataset, convert it to LMDB, train ResNet-18 on CPU, show top-1 rising
	rm -rf $(DEMO)
	$(PY) -m tests.datagen $(DEMO)/jpeg --classes 10 --train-per-class 40 --val-per-class 10
	$(PY) folder2lmdb.py --dataset $(DEMO)/jpeg/train -o $(DEMO)/lmdb/train
	$(PY) folder2lmdb.py --dataset $(DEMO)/jpeg/val -o $(DEMO)/lmdb/val
	$(PY) main.py -c configs/smoke.yaml --lmdb $(DEMO)/lmdb --output-dir $(DEMO)/output
	$(PY) -c "import json; r = [json.loads(l) for l in open('$(DEMO)/output/metrics.jsonl')]; \
	print('val top-1 by epoch:', ' -> '.join(f\"{x['val_acc1']:.0f}%\" for x in r)); \
	assert r[-1]['val_acc1'] > r[0]['val_acc1'], 'validation accuracy did not rise'"

test: install ## run the test suite (generated data and ../shared/data/imagenet-sample)
	$(PY) -m pytest -q -rs

convert-imagenet: install ## IMAGENET=/path/to/imagenet OUT=/path/to/lmdb: convert train/ and val/ to LMDB
	@test -n "$(IMAGENET)" -a -n "$(OUT)" || { echo "usage: make convert-imagenet IMAGENET=/path/to/imagenet OUT=/path/to/lmdb"; exit 2; }
	$(PY) folder2lmdb.py --dataset $(IMAGENET)/train -o $(OUT)/train -j $(JOBS)
	$(PY) folder2lmdb.py --dataset $(IMAGENET)/val -o $(OUT)/val -j $(JOBS)

train: install ## CONFIG=configs/resnet50.yaml DATA=/path/to/lmdb ARGS='--lmdb ...': train with a preset
	@test -n "$(DATA)" || { echo "usage: make train CONFIG=configs/resnet18.yaml DATA=/path/to/data [ARGS='--lmdb']"; exit 2; }
	$(PY) main.py -c $(CONFIG) $(DATA) $(ARGS)

clean: ## remove demo data, caches and test leftovers (keeps .venv)
	rm -rf $(DEMO) .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
