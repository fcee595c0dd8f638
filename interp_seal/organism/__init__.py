"""The bundled model organism: build, train and load."""
