"""What to run: the matrix YAML validated (matrix), expanded into cells, and the model it names."""
