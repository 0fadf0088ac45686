"""Reading a compiled program: its collectives, the HLO text, and the census of lesson 10's forms."""
