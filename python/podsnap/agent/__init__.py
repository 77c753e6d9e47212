"""podsnap node agent: one per GPU node. Captures the PodSnapshotContents bound to its node and restores
the restore pods scheduled on it, driving the node engine through the `Executor` seam (`executor.py`)."""
