"""The Lifecycle Manager: turns job attempts into running learners on a backend and removes them."""
