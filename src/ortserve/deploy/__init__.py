"""Running ortserve past one process: deploy/ray.py puts create_app on Ray Serve."""
