"""Sample outputs shipped with the course (read with course_utils.smi.sample_output)."""
