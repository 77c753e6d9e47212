"""Helpers of the end-to-end suite: cluster access (`k8s`), the user's flow (`flow`), settings (`config`)."""
