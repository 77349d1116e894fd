"""The engine side: the sglang stand-in (emulator), sglang's protocol models, the prefix cache, sglang's tool-call parser."""
