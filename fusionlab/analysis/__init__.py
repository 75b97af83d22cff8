"""What the passes prove before they rewrite: legality, the algebra of each fold, op classes, shape
values, the layout prover and the working set the mixed planner sizes groups by."""
