"""Area monitoring: Prometheus, Alertmanager and Grafana on the monitoring node(s), node_exporter
everywhere, GPU metrics (DCGM exporter or our nvidia-smi collector) and Slurm metrics."""
