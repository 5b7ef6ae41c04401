"""Drop-in surfaces of other engines' Python modules."""
