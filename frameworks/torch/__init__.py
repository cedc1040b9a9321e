"""torch support: the launch environment a backend gives a learner, and the helper a training script imports."""
