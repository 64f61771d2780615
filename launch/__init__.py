"""Running s2sjax on Cloud TPU VMs and pod slices (`python -m launch.tpu`)."""
