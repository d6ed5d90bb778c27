"""The save path: host staging, background chunk writes, the GC lease on a commit, lossy
moments, the in-flight save, what a failed save does, and saves finished at interpreter exit."""
