"""How well the GPU was used: occupancy and resource utilization (`traceq ru`), FLOPs and
compute efficiency against the peak of each precision (`traceq ce`), and DeLTA's memory-traffic
model (`traceq traffic`), with the GPU tables they need."""
