"""Where the agent sandbox's files are on the node (the `models` volume): the SIF the tasks run in and the agent
CLI mounted into every sandbox. The task template (reward.tasks) and the assets check (stack.assets) read them."""

SANDBOX_DIR = "/models/apptainer"  # = polar_apptainer_image_dir in tasks.polar_config
SIF_NAME = "polarstack-code.sif"
SIF_PATH = f"{SANDBOX_DIR}/{SIF_NAME}"
AGENT_CLI_DIR = f"{SANDBOX_DIR}/agent-cli"  # = polar_agent_cli_dir; mounted at AGENT_CLI_MOUNT in every sandbox
AGENT_CLI_MOUNT = "/opt/node"
AGENT_CLI_BIN = "claude"  # the binary of AGENT_CLI_PACKAGE (its package.json "bin")
SANDBOX_MARKER = f"{SANDBOX_DIR}/polarstack-sandbox.json"
