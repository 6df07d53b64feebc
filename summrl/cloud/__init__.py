"""Cloud runs: backend=skypilot launches this same job on a SkyPilot-provisioned GPU (see launch.py)."""
