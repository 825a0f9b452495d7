"""Many models, one table: the atlas merges each model's results onto relative depth, compares
criteria and calibration texts, and writes the table as a dataset `datasets` reads back."""
