"""What a worker tells the outside about itself: metrics in Prometheus's text format (``prometheus``), served by
``http``; traces and OpenTelemetry metrics (``otel``)."""
