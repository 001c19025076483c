"""Two traces or runs side by side (`traceq compare`): per layer, kernel, library or stage,
per GPU for runs of different sizes, and the regression gate (`--gate`)."""
