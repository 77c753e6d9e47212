"""The Kubernetes layer of the operator and the agent: both import it, neither imports the other.

client       credentials (kopf and the `kubernetes` client alike), API groups, status writes
conditions   metav1.Condition lists and kopf patch functions that are safe to replay
events       Events on podsnap's objects and pods
reporter     one call: conditions + Event + metric
env          the chart's environment variables, validated
settings     the kopf settings both share
entrypoint   flags, logging, metrics and kopf's loop around a component's handlers
metrics      a component's Prometheus registry and endpoint
podshape     the control volume and directory, standby and readiness of pods
"""
