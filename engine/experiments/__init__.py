"""One module per experiment; each is a generator of events that ends with a Result."""
