# Two commands do everything on a fresh machine (each sets up first; a second set-up takes seconds):
#   make demo   - 2-rank horovodrun training on the offline digits data set
#   make test   - the test suite
.PHONY: setup demo test bench lint-docker clean
PY := .venv/bin/python

setup:
	bash scripts/install.sh

demo: setup
	launch/horovodrun.sh -np 2 -hostfile hostfiles/localhost --config configs/demo.yaml

test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

bench: setup
	$(PY) benchmarks/data_pipeline.py
	$(PY) benchmarks/step_overhead.py

clean:
	rm -rf .venv build *.egg-info
