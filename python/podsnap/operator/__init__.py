"""podsnap operator: reconciles SnapshotJob, PodSnapshot, PodSnapshotContent and SnapshotPolicy, and shapes
restore pods through a pod-create webhook. Cluster-wide and unprivileged; it never imports `podsnap.engine`."""
