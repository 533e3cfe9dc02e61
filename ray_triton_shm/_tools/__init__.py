"""The tools: the doctor's node checks and their report, and the regions' status."""
