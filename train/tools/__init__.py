"""Commands beside training: the mesh planner (`plan`) and the local multi-process launcher."""
