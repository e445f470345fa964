"""API schemas (pydantic), named by role: ``JobPublic``, ``PatternCreate``, ..."""
