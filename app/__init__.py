"""autofusion's service layer (the REST API arrives with issue 3) and its CLI."""
