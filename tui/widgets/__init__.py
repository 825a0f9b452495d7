"""The console's widgets, one purpose per module."""
