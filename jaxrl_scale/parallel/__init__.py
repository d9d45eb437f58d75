"""Device layout: trainer and generator slices, their meshes, weight transfer between them."""
