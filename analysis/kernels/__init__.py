"""What each kernel is, and which kernels took the time: classification by name (library,
operation, precision; the rules are data, kernel_rules.toml) and the `traceq top` rankings."""
