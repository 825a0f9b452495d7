"""Scaling analyses: the loss-decomposition fit and the teacher-student depth toy models."""
