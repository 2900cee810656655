"""Tools beside training: the mesh planner's command (`plan`) and its library (`planning`, which
`--mesh auto` reads too), a run's step predicted and compiled side by side (`step_analysis`: the
loop's MFU meter, the benches and the tests read it), and the local multi-process launcher."""
