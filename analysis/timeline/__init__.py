"""The timeline: when the GPU worked, when it waited and why (`traceq idle`), what launching
cost (`traceq launches`), and the `nsys stats` reports (`traceq stats`)."""
