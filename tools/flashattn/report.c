#include "common.h"
int cmd_report(int argc, char **argv) { (void)argc; (void)argv; return 0; }
