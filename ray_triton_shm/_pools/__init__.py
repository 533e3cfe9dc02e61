"""A client's pools over time: the registry, following the model and Triton as they change,
scaling, abandoned slots, dead owners' regions, and where a stopped call goes on."""
