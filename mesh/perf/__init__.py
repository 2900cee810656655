"""The performance model: what a step, a run or an inference costs, predicted from sizes, and what
XLA compiled, counted. Tools, the benches, `--mesh auto` and the loop's MFU meter read it; the
runtime (mesh specs, rules, the pipeline schedule, the models, the train engine) never imports it.

- `formulas`          analytic FLOPs, collective bytes and memory of one training step on a mesh
- `sharded_params`    a built model's parameter bytes per device (the formulas' `ParamBytes`)
- `transformer_shape` a transformer known only by its sizes (`--shape`): cost shape, parameters
- `hardware`          the GPU table: peaks, bandwidths, links, power, prices
- `planner`           the mesh planner: every mesh, schedule and remat priced and ranked
- `explanation`       why the planner's pick is what it is, axis by axis and the sequence's terms
- `roofline`          the inference roofline: images/s per GPU, compute vs HBM bound
- `run_cost`          wall time, GPU-hours and money of a run, rented or owned
- `hlo_counts`        FLOPs, collective bytes and the traffic outside the matmuls counted in a
                      compiled program's HLO text
- `published_runs`    Megatron-LM's published runs replayed through the planner (bench, tests)
- `published_h100`    NeMo's published H100 table replayed on its meshes (bench, tests)

Nothing is imported here: `import triskele.mesh.perf.planner` loads what the planner needs.
The sizes they read (`triskele.mesh.shape.ModelShape`) and the pipeline schedule's own counts
(`triskele.mesh.schedule.schedule_iterations`, `bubble_fraction`) live with the runtime.
"""
