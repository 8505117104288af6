"""Learned models with a scikit-learn-style API and versioned persistence."""
