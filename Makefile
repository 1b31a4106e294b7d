# Two commands do everything on a fresh machine (each sets up first; a second set-up takes seconds):
#   make demo   - 2-rank horovodrun training on the offline digits data set
#   make test   - the test suite
#   make bench-quick - every figure README.md shows measured again (14 minutes on 2 cores with bf16), then the docs' tables
#   make bench  - the headline benchmarks into benchmarks/results/, then the docs' tables from them
.PHONY: setup demo test bench bench-quick lint-docker clean
PY := .venv/bin/python

setup:
	bash scripts/install.sh

demo: setup
	launch/horovodrun.sh -np 2 -hostfile hostfiles/localhost --config configs/demo.yaml

test: setup
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 tests

# make bench-quick - the results files README.md's tables show (the test in
# tests/test_docs_tables.py holds these commands to them), measured again, then every table
# rendered again. The compute ratio in 8 rounds of 2 epochs, the accuracy at np 1, 2 and 4 on 3
# seeds as in make bench. How long each takes is in its results file (started_utc to
# finished_utc): on the AMD EPYC with AVX-512 BF16 they were last made on, 9 and 5 minutes (14
# for the whole target); where the processor has no bf16 the accuracy runs compute in fp32 and take
# longer. No root needed. Each job's line says where its benchmark is and about how long it has left.
BENCH_QUICK_OUT := logs/bench-quick
bench-quick: setup
	rm -rf $(BENCH_QUICK_OUT)
	-$(PY) benchmarks/compute.py --models vgg11 --repeats 8 --epochs 2 --no-compile --tag vgg11 --out $(BENCH_QUICK_OUT)/compute-vgg11
	-$(PY) benchmarks/convergence.py --models vgg11 --cases np1 np2 np4 --epochs 6 --seeds 200 201 202 --out $(BENCH_QUICK_OUT)/convergence
	$(PY) -m testbed.render_docs

# make bench - the headline benchmarks, hours on 2 cores (each results file records how long it took; as root: the bytes and
# compression benchmarks start a cluster of network namespaces). Each writes its results file to
# benchmarks/results/ (every round, medians, intervals, failed rounds with their reason); a failed
# round does not stop the rest. Then the tables in README.md and docs/ are made again from them.
BENCH_OUT := logs/bench
bench: setup
	rm -rf $(BENCH_OUT)
	-$(PY) benchmarks/data_pipeline.py --repeats 3
	-$(PY) benchmarks/sync_methods.py --np 1 2 4 --dataset synthetic --steps 8 --repeats 5 --out $(BENCH_OUT)/sync_methods
	-$(PY) benchmarks/sync_methods.py --np 2 --methods horovod ddp --dataset synthetic --steps 8 --repeats 10 --no-plain --resolve 0.97 --budget 30 --tag np2 --out $(BENCH_OUT)/sync_methods-np2
	-$(PY) benchmarks/sync_methods.py --cluster-only --cluster 2 --rate 1gbit --methods horovod ddp --mpi-operations --cluster-cycle-time-ms 0 --dataset synthetic --cluster-batch-size 32 --cluster-steps 8 --cluster-repeats 10 --tag cluster2-1gbit --out $(BENCH_OUT)/sync_methods-cluster2-1gbit
	-$(PY) benchmarks/sync_methods.py --cluster-only --cluster 2 --rate 100mbit --methods horovod ddp --mpi-operations --cluster-cycle-time-ms 0 --dataset synthetic --cluster-batch-size 32 --cluster-steps 4 --cluster-repeats 10 --tag cluster2-100mbit --out $(BENCH_OUT)/sync_methods-cluster2-100mbit
	-$(PY) benchmarks/step_validation.py --rates 1gbit 100mbit --nps 2 --syncs horovod --options plain --traced horovod ddp --repeats 5 --dataset synthetic --batch-size 32 --steps 6 --tag cluster2 --out $(BENCH_OUT)/step_validation-cluster2
	-$(PY) benchmarks/comm_options.py --np 4 --acc-epochs 0 --out $(BENCH_OUT)/comm_options
	-$(PY) benchmarks/compression.py --np 2 --acc-epochs 0 --schemes none powersgd topk --rates 1gbit 100mbit --repeats 5 --resolve 0.10 --budget 25 --tag np2 --out $(BENCH_OUT)/compression-np2
	-$(PY) benchmarks/time_to_accuracy.py --out $(BENCH_OUT)/time_to_accuracy
	-$(PY) benchmarks/crossover_check.py --runs $(BENCH_OUT)/time_to_accuracy --out $(BENCH_OUT)/crossover_check
	-$(PY) benchmarks/convergence.py --models vgg11 --cases np1 np2 np4 --epochs 6 --seeds 200 201 202 --out $(BENCH_OUT)/convergence
	-$(PY) benchmarks/convergence.py --models vgg11 --cases np1 np2 np1-fp32 np2-fp32 --seeds 200 201 202 203 204 --tag vgg11-compute --out $(BENCH_OUT)/convergence-vgg11-compute
	-$(PY) benchmarks/reliability.py --out $(BENCH_OUT)/reliability
	-$(PY) benchmarks/compute.py --out $(BENCH_OUT)/compute
	-$(PY) benchmarks/compute.py --models vgg11 --repeats 18 --no-compile --tag vgg11 --out $(BENCH_OUT)/compute-vgg11
	-$(PY) benchmarks/data_difficulty.py --out $(BENCH_OUT)/data_difficulty
	$(PY) -m testbed.render_docs

clean:
	rm -rf .venv build *.egg-info
